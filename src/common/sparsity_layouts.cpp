// The layout algorithms of DeepSpeed's sparsity configs (spec sections 1.0-1.6), in DeepSpeed's
// order of random draws, with the unidirectional defects fixed (Decision 3), painted into a dense
// layout (make_layout) or into per-row column lists (the index's build). Host-only common layer.
#include "common/sparsity_layouts.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/python_random.h"

namespace sciattn {
namespace detail {
namespace {

using Options = LayoutBuildOptions;

// Parameters may be as large as int64 allows (windows longer than the sequence are legal), so
// window ends are computed without overflowing. Both arguments are >= 0.
int64_t sat_add(int64_t a, int64_t b) {
  return b > INT64_MAX - a ? INT64_MAX : a + b;
}

// Writes 1s into one head of a layout of N x N blocks, through a LayoutSink (a dense layout or
// sparse row lists: both builds share these painters, so the random draws happen in one order).
// Every range is half-open and clipped to [0, N), which is how DeepSpeed's Python slices behave
// for the non-negative bounds we allow.
class HeadPainter {
 public:
  HeadPainter(LayoutSink* sink, int64_t n, int64_t head) : sink_(sink), n_(n), head_(head) {}

  int64_t n() const { return n_; }

  void set(int64_t r, int64_t c) { sink_->fill(head_, r, r + 1, c, c + 1); }

  // Rows [r0, r1) x columns [c0, c1).
  void fill(int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    r0 = std::max<int64_t>(r0, 0);
    c0 = std::max<int64_t>(c0, 0);
    r1 = std::min(r1, n());
    c1 = std::min(c1, n());
    if (r0 < r1 && c0 < c1) sink_->fill(head_, r0, r1, c0, c1);
  }

  // A local window [a, b): full when bidirectional, lower triangle (with the diagonal) when
  // unidirectional.
  void window(int64_t a, int64_t b, bool uni) {
    for (int64_t r = a; r < std::min(b, n()); ++r) fill(r, r + 1, a, uni ? r + 1 : b);
  }

  // A symmetric band of w blocks on each side of the diagonal, in every row.
  void band(int64_t w) {
    for (int64_t r = 0; r < n(); ++r) fill(r, r + 1, r - std::min(w, r), sat_add(sat_add(r, w), 1));
  }

 private:
  LayoutSink* sink_;
  int64_t n_;
  int64_t head_;
};

// The dense sink: writes the [H, N, N] layout itself.
class DenseLayoutSink final : public LayoutSink {
 public:
  explicit DenseLayoutSink(Layout* layout) : layout_(layout) {}

  void fill(int64_t head, int64_t r0, int64_t r1, int64_t c0, int64_t c1) override {
    for (int64_t r = r0; r < r1; ++r) {
      std::fill_n(layout_->blocks.begin() + layout_->index(head, r, c0), c1 - c0, uint8_t{1});
    }
  }

  // Zeroes every block above the diagonal, in every head.
  void make_block_causal() override {
    for (int64_t h = 0; h < layout_->num_heads; ++h) {
      for (int64_t r = 0; r < layout_->num_row_blocks; ++r) {
        for (int64_t c = r + 1; c < layout_->num_col_blocks; ++c) layout_->at(h, r, c) = 0;
      }
    }
  }

  // DeepSpeed's check_and_propagate_first_head_layout: a shared layout is head 0, copied.
  void share_first_head() override {
    const int64_t per_head = layout_->num_row_blocks * layout_->num_col_blocks;
    for (int64_t h = 1; h < layout_->num_heads; ++h) {
      std::copy_n(layout_->blocks.begin(), per_head, layout_->blocks.begin() + h * per_head);
    }
  }

  void copy_user_layout(const Layout& user) override {
    if (user.num_heads == layout_->num_heads) {
      layout_->blocks = user.blocks;
    } else {  // one layout for every head
      std::copy(user.blocks.begin(), user.blocks.end(), layout_->blocks.begin());
      share_first_head();
    }
  }

 private:
  Layout* layout_;
};

Status reject(SparsityMode mode, const std::string& message) {
  return Status::invalid_argument(std::string(sparsity_class_name(mode)) + ": " + message);
}

// "must be <= the number of blocks seq_len / block = 64 / 16 = 4", the tail of the messages of
// DeepSpeed's make_layout checks.
Status check_fits(SparsityMode mode, const char* name, int64_t value, int64_t seq_len,
                  int64_t block) {
  const int64_t n = seq_len / block;
  if (value > n) {
    return reject(
        mode, std::string(name) + " (" + std::to_string(value) +
                  ") must be <= the number of blocks seq_len / block = " + std::to_string(seq_len) +
                  " / " + std::to_string(block) + " = " + std::to_string(n));
  }
  return Status::ok_status();
}

// Per-row random blocks of BigBird and Variable: one sample(range(population), k) per row, rows
// in order (spec 1.8). A unidirectional row r draws min(R, r+1) columns from [0, r] (the fix of
// Decision 3; DeepSpeed's Variable draws from all N columns, its BigBird fails for R > r+1).
Status draw_random_rows(SparsityMode mode, int64_t num_random, bool uni, bool uni_population,
                        const Options& options, PythonRandom& rng, HeadPainter& p) {
  if (num_random == 0) return Status::ok_status();  // sample(..., 0) draws nothing
  std::vector<int64_t> cols;
  for (int64_t r = 0; r < p.n(); ++r) {
    int64_t population = p.n();
    int64_t k = num_random;
    if (uni && (uni_population || !options.reproduce_deepspeed_defects)) population = r + 1;
    if (uni && !options.reproduce_deepspeed_defects) k = std::min(k, population);
    if (k > population) {
      return reject(mode,
                    "DeepSpeed fails here (ValueError: Sample larger than population): "
                    "unidirectional num_random_blocks (" +
                        std::to_string(num_random) + ") > row " + std::to_string(r) + " + 1");
    }
    Status s = rng.sample_range(population, k, &cols);
    if (!s.ok()) return s;
    for (int64_t c : cols) p.set(r, c);
  }
  return Status::ok_status();
}

// Global blocks by index or by [start, end) range (Variable, BSLongformer). `rows_from_start`:
// the global columns start at their own row (unidirectional Variable) instead of row 0.
void paint_globals(const std::vector<int64_t>& starts,
                   const std::optional<std::vector<int64_t>>& ends, bool horizontal,
                   bool rows_from_start, HeadPainter& p) {
  const int64_t n = p.n();
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t s = starts[i];
    if (s >= n) continue;  // DeepSpeed skips globals past the end (needed for the crop rule)
    const int64_t e = ends ? std::min((*ends)[i], n) : s + 1;
    if (horizontal) p.fill(s, e, 0, n);
    p.fill(rows_from_start ? s : 0, n, s, e);
  }
}

// ---- one function per config: checks that need N, then the pattern of each layout head ----

struct Builder {
  int64_t seq_len;
  const Options& options;
  LayoutSink* sink;
  int64_t num_heads;
  int64_t num_blocks;  // N = seq_len / block

  int64_t n() const { return num_blocks; }

  // Runs `paint(head, painter)` for the heads DeepSpeed computes, then shares head 0 if the
  // layout is not per head.
  template <typename Paint>
  Status for_layout_heads(bool per_head, Paint&& paint) {
    const int64_t heads = per_head ? num_heads : 1;
    for (int64_t h = 0; h < heads; ++h) {
      HeadPainter p(sink, num_blocks, h);
      Status s = paint(h, p);
      if (!s.ok()) return s;
    }
    if (!per_head) sink->share_first_head();
    return Status::ok_status();
  }

  Status operator()(const DenseSparsityConfig&) {
    for (int64_t h = 0; h < num_heads; ++h) sink->fill(h, 0, num_blocks, 0, num_blocks);
    return Status::ok_status();
  }

  Status operator()(const FixedSparsityConfig& c) {
    const auto mode = SparsityMode::kFixed;
    // Ours: DeepSpeed would slice from a negative start here (spec 1.0: reject).
    Status fits = check_fits(mode, "num_global_blocks", c.num_global_blocks, seq_len, c.block);
    if (!fits.ok()) return fits;
    const bool uni = c.attention == AttentionDirection::kUnidirectional;
    const int64_t lw = c.num_local_blocks;
    const int64_t g = c.num_global_blocks;
    Status s = for_layout_heads(c.different_layout_per_head, [&](int64_t h, HeadPainter& p) {
      const int64_t nb = p.n();
      for (int64_t w0 = 0; w0 < nb; w0 = sat_add(w0, lw)) p.window(w0, sat_add(w0, lw), uni);
      // Global columns [s, s+G) start at row s when unidirectional (DeepSpeed), so rows s..s+G-2
      // see later blocks when G > 1; make_block_causal below removes those.
      auto global = [&](int64_t start) {
        p.fill(uni ? start : 0, nb, start, start + g);
        if (c.horizontal_global_attention) p.fill(start, start + g, 0, nb);
      };
      // Head h uses the (h mod P)-th representative position counted from each window's end.
      const int64_t offset = lw - (1 + h % c.num_different_global_patterns) * g;
      const int64_t full_end = nb - nb % lw;  // end of the last full window
      for (int64_t i = offset; i < full_end; i = sat_add(i, lw)) global(i);
      if (full_end < nb) global(std::min(sat_add(full_end, offset), nb - g));  // short window
      return Status::ok_status();
    });
    if (s.ok() && uni && !options.reproduce_deepspeed_defects) sink->make_block_causal();
    return s;
  }

  Status operator()(const VariableSparsityConfig& c, PythonRandom& rng) {
    const auto mode = SparsityMode::kVariable;
    Status fits = check_fits(mode, "num_random_blocks", c.num_random_blocks, seq_len, c.block);
    if (!fits.ok()) return fits;
    const bool uni = c.attention == AttentionDirection::kUnidirectional;
    Status s = for_layout_heads(c.different_layout_per_head, [&](int64_t, HeadPainter& p) {
      // Order: random, local, global; only the random step draws.
      Status drawn = draw_random_rows(mode, c.num_random_blocks, uni, /*uni_population=*/false,
                                      options, rng, p);
      if (!drawn.ok()) return drawn;
      int64_t start = 0;
      for (int64_t w : c.local_window_blocks) {
        p.window(start, sat_add(start, w), uni);
        start = sat_add(start, w);  // not clamped to N, as in DeepSpeed
      }
      const int64_t last = c.local_window_blocks.back();
      for (int64_t i = start; i < p.n(); i = sat_add(i, last)) p.window(i, sat_add(i, last), uni);
      // Unidirectional global ranges start at their first row, as in DeepSpeed; the blocks this
      // puts above the diagonal are removed below.
      paint_globals(c.global_block_indices, c.global_block_end_indices,
                    c.horizontal_global_attention, uni, p);
      return Status::ok_status();
    });
    if (s.ok() && uni && !options.reproduce_deepspeed_defects) sink->make_block_causal();
    return s;
  }

  Status operator()(const BigBirdSparsityConfig& c, PythonRandom& rng) {
    const auto mode = SparsityMode::kBigBird;
    // DeepSpeed's make_layout checks, in its order.
    for (auto [name, value] :
         {std::pair<const char*, int64_t>{"num_random_blocks", c.num_random_blocks},
          {"num_sliding_window_blocks", c.num_sliding_window_blocks},
          {"num_global_blocks", c.num_global_blocks}}) {
      Status fits = check_fits(mode, name, value, seq_len, c.block);
      if (!fits.ok()) return fits;
    }
    const bool uni = c.attention == AttentionDirection::kUnidirectional;
    Status s = for_layout_heads(c.different_layout_per_head, [&](int64_t, HeadPainter& p) {
      Status drawn = draw_random_rows(mode, c.num_random_blocks, uni, /*uni_population=*/true,
                                      options, rng, p);
      if (!drawn.ok()) return drawn;
      p.band(c.num_sliding_window_blocks / 2);  // an even window acts as the next odd one
      p.fill(0, c.num_global_blocks, 0, p.n());
      p.fill(0, p.n(), 0, c.num_global_blocks);
      return Status::ok_status();
    });
    if (s.ok() && uni) sink->make_block_causal();  // DeepSpeed's tril
    return s;
  }

  Status operator()(const BSLongformerSparsityConfig& c) {
    const auto mode = SparsityMode::kBSLongformer;
    Status fits = check_fits(mode, "num_sliding_window_blocks", c.num_sliding_window_blocks,
                             seq_len, c.block);
    if (!fits.ok()) return fits;
    Status s = for_layout_heads(c.different_layout_per_head, [&](int64_t, HeadPainter& p) {
      p.band(c.num_sliding_window_blocks / 2);
      // Global blocks are both rows and columns here, whatever the direction.
      paint_globals(c.global_block_indices, c.global_block_end_indices, /*horizontal=*/true,
                    /*rows_from_start=*/false, p);
      return Status::ok_status();
    });
    if (s.ok() && c.attention == AttentionDirection::kUnidirectional) sink->make_block_causal();
    return s;
  }

  Status operator()(const LocalSlidingWindowSparsityConfig& c) {
    const auto mode = SparsityMode::kLocalSlidingWindow;
    Status fits = check_fits(mode, "num_sliding_window_blocks", c.num_sliding_window_blocks,
                             seq_len, c.block);
    if (!fits.ok()) return fits;
    const bool uni = c.attention == AttentionDirection::kUnidirectional;
    const int64_t w = c.num_sliding_window_blocks / 2;
    // No different_layout_per_head in DeepSpeed: always one shared layout.
    return for_layout_heads(false, [&](int64_t, HeadPainter& p) {
      for (int64_t r = 0; r < p.n(); ++r) {
        p.fill(r, r + 1, r - std::min(w, r), uni ? r + 1 : sat_add(sat_add(r, w), 1));
      }
      return Status::ok_status();
    });
  }

  Status operator()(const UserSparsityConfig& c) {
    const Layout& user = c.layout;
    if (user.num_row_blocks != n()) {
      return reject(SparsityMode::kUser, "seq_len / block = " + std::to_string(seq_len) + " / " +
                                             std::to_string(c.block) + " = " + std::to_string(n()) +
                                             " blocks, but the user layout has " +
                                             std::to_string(user.num_row_blocks) +
                                             "; it is the layout of seq_len " +
                                             std::to_string(user.num_row_blocks * c.block) +
                                             " (use crop_layout for shorter lengths)");
    }
    sink->copy_user_layout(user);
    return Status::ok_status();
  }
};

// The sparse sink: per head, the column ranges painted into each row, kept only inside the
// crop (rows and columns < num_blocks); finish() turns them into sorted, deduplicated column
// lists. Its cost is O(ranges + nnz + N) per stored head, where the dense layout costs N^2.
class SparseLayoutSink final : public LayoutSink {
 public:
  SparseLayoutSink(int64_t num_heads, int64_t num_blocks)
      : num_heads_(num_heads),
        num_blocks_(num_blocks),
        ranges_(static_cast<size_t>(num_heads)),
        rects_(static_cast<size_t>(num_heads)) {}

  void fill(int64_t head, int64_t r0, int64_t r1, int64_t c0, int64_t c1) override {
    r1 = std::min(r1, num_blocks_);
    c1 = std::min(c1, num_blocks_);
    if (c0 >= c1 || r0 >= r1) return;
    // int32 halves the memory of the ranges: N <= 65,536 since N * N <= kMaxLayoutEntries.
    const auto rect = Rect{static_cast<int32_t>(r0), static_cast<int32_t>(r1),
                           static_cast<int32_t>(c0), static_cast<int32_t>(c1)};
    // A range of several rows (a global column, a whole dense layout) is kept as painted, once,
    // rather than once per row: those were a third to a half of all ranges (BigBird,
    // BSLongformer), each sorted into its row.
    if (r1 - r0 > 1) {
      rects_[static_cast<size_t>(head)].push_back(rect);
    } else {
      ranges_[static_cast<size_t>(head)].push_back({rect.r0, rect.c0, rect.c1});
    }
  }

  void make_block_causal() override { causal_ = true; }  // applied in finish()
  void share_first_head() override { shared_ = true; }

  void copy_user_layout(const Layout& user) override {
    // The given layout, read once as runs of ones (a user config is normally built densely).
    const int64_t heads = user.num_heads == num_heads_ ? num_heads_ : 1;
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t r = 0; r < std::min(user.num_row_blocks, num_blocks_); ++r) {
        for (int64_t c = 0; c < user.num_col_blocks;) {
          if (user.at(h, r, c) == 0) {
            ++c;
            continue;
          }
          const int64_t begin = c;
          while (c < user.num_col_blocks && user.at(h, r, c) != 0) ++c;
          fill(h, r, r + 1, begin, c);
        }
      }
    }
    if (heads == 1 && num_heads_ > 1) shared_ = true;
  }

  void finish(SparseLayoutRows* out) {
    const int64_t n = num_blocks_;
    out->num_heads = num_heads_;
    out->num_blocks = n;
    out->stored_heads = shared_ ? 1 : num_heads_;
    out->row_offsets.assign(static_cast<size_t>(out->stored_heads * n + 1), 0);
    // The arrays are sized once for the painted blocks (ranges may overlap, so the lists may be
    // shorter), written through pointers, and cut to the listed blocks at the end.
    size_t painted = 0;
    for (int64_t h = 0; h < out->stored_heads; ++h) {
      for (const Range& g : ranges_[static_cast<size_t>(h)]) {
        painted += static_cast<size_t>(g.c1 - g.c0);
      }
      for (const Rect& g : rects_[static_cast<size_t>(h)]) {
        painted += static_cast<size_t>(g.c1 - g.c0) * static_cast<size_t>(g.r1 - g.r0);
      }
    }
    out->rows.resize(painted);
    out->cols.resize(painted);
    int64_t* rows = out->rows.data();
    int64_t* cols = out->cols.data();
    int64_t listed = 0;
    std::vector<int64_t> starts(static_cast<size_t>(n + 1));
    std::vector<int64_t> next(static_cast<size_t>(n));
    std::vector<Range> by_row;
    for (int64_t h = 0; h < out->stored_heads; ++h) {
      const auto& ranges = ranges_[static_cast<size_t>(h)];
      // A counting sort of the one-row ranges by row (the painters emit them in several sweeps).
      std::fill(starts.begin(), starts.end(), 0);
      for (const Range& g : ranges) ++starts[static_cast<size_t>(g.row + 1)];
      for (int64_t r = 0; r < n; ++r) {
        next[static_cast<size_t>(r)] = starts[static_cast<size_t>(r)];
        starts[static_cast<size_t>(r + 1)] += starts[static_cast<size_t>(r)];
      }
      by_row.resize(ranges.size());
      for (const Range& g : ranges) {
        by_row[static_cast<size_t>(next[static_cast<size_t>(g.row)]++)] = g;
      }
      // The ranges of several rows, by first column: each row takes those that cover it.
      std::vector<Rect>& rects = rects_[static_cast<size_t>(h)];
      std::sort(rects.begin(), rects.end(),
                [](const Rect& x, const Rect& y) { return x.c0 < y.c0; });
      for (int64_t r = 0; r < n; ++r) {
        Range* first = by_row.data() + starts[static_cast<size_t>(r)];
        Range* const last = by_row.data() + starts[static_cast<size_t>(r + 1)];
        sort_by_start(first, last);
        const Rect* rect = rects.data();
        const Rect* const rects_end = rect + rects.size();
        auto skip_rects_off_row = [&] {
          while (rect != rects_end && !(rect->r0 <= r && r < rect->r1)) ++rect;
        };
        skip_rects_off_row();
        // The row's ranges in order of their first column (its own and the covering rects,
        // merged): each emits only the columns past the furthest end so far, so every column
        // appears once, in ascending order.
        int64_t done = 0;
        while (first != last || rect != rects_end) {
          int64_t c0 = 0, c1 = 0;
          if (rect == rects_end || (first != last && first->c0 <= rect->c0)) {
            c0 = first->c0;
            c1 = first->c1;
            ++first;
          } else {
            c0 = rect->c0;
            c1 = rect->c1;
            ++rect;
            skip_rects_off_row();
          }
          const int64_t end = causal_ ? std::min<int64_t>(c1, r + 1) : c1;
          for (int64_t c = std::max(c0, done); c < end; ++c) {
            rows[listed] = r;
            cols[listed] = c;
            ++listed;
          }
          done = std::max(done, end);
        }
        out->row_offsets[static_cast<size_t>(h * n + r + 1)] = listed;
      }
    }
    out->rows.resize(static_cast<size_t>(listed));
    out->cols.resize(static_cast<size_t>(listed));
  }

 private:
  struct Range {  // columns [c0, c1) of one row
    int32_t row, c0, c1;
  };
  struct Rect {  // rows [r0, r1) x columns [c0, c1)
    int32_t r0, r1, c0, c1;
  };

  // Sorts one row's ranges by start. Most rows hold two or three (a window, a random block), for
  // which an insertion sort is a few compares and moves, with no sortedness check and no call
  // (BigBird at 65,536 tokens and block 16 sorts 4,096 such rows); rows with many ranges take
  // std::sort unless already sorted. The order of ranges with equal starts does not matter:
  // finish() emits their union.
  static void sort_by_start(Range* first, Range* last) {
    constexpr std::ptrdiff_t kInsertionSortMax = 16;
    auto by_start = [](const Range& x, const Range& y) { return x.c0 < y.c0; };
    // An empty row may come as two null pointers, and first + 1 must not be formed from null.
    if (last - first < 2) return;
    if (last - first > kInsertionSortMax) {
      if (!std::is_sorted(first, last, by_start)) std::sort(first, last, by_start);
      return;
    }
    for (Range* i = first + 1; i < last; ++i) {
      const Range x = *i;
      Range* j = i;
      for (; j > first && by_start(x, *(j - 1)); --j) *j = *(j - 1);
      *j = x;
    }
  }

  int64_t num_heads_;
  int64_t num_blocks_;
  std::vector<std::vector<Range>> ranges_;  // [H] the one-row ranges painted into each head
  std::vector<std::vector<Rect>> rects_;    // [H] the ranges of several rows
  bool causal_ = false;
  bool shared_ = false;
};

// The checks of the length that make_layout makes before painting (after the config's own).
Status check_layout_length(const SparsityConfig& config, int64_t seq_len) {
  const SparsityMode mode = sparsity_mode(config);
  const SparsityCommon& common = sparsity_common(config);
  if (seq_len < 1 || seq_len % common.block != 0) {
    std::string message = "seq_len (" + std::to_string(seq_len) +
                          ") must be a positive multiple of block (" +
                          std::to_string(common.block) + ")";
    if (seq_len > 0) {
      message += "; pad the sequence to " +
                 std::to_string((seq_len / common.block + 1) * common.block) + " tokens";
    }
    return reject(mode, message);
  }
  const int64_t n = seq_len / common.block;
  int64_t entries = 0;
  // The sparse build keeps this limit too, so that both builds accept the same lengths.
  if (!checked_layout_entries(common.num_heads, n, n, &entries) || entries > kMaxLayoutEntries) {
    return reject(mode, "the layout [num_heads, seq_len / block, seq_len / block] = [" +
                            std::to_string(common.num_heads) + ", " + std::to_string(n) + ", " +
                            std::to_string(n) +
                            "] would have more than kMaxLayoutEntries (2^32) "
                            "blocks; use a larger block or a shorter seq_len");
  }
  return Status::ok_status();
}

// Paints the layout of a checked config and length into `sink`.
Status paint_layout(const SparsityConfig& config, int64_t seq_len, const Options& options,
                    LayoutSink* sink) {
  const SparsityCommon& common = sparsity_common(config);
  // One generator per call, seeded like `random.seed(seed)` before DeepSpeed's make_layout.
  PythonRandom rng(common.seed);
  Builder builder{seq_len, options, sink, common.num_heads, seq_len / common.block};
  return std::visit(
      [&](const auto& c) {
        using T = std::decay_t<decltype(c)>;
        if constexpr (std::is_same_v<T, VariableSparsityConfig> ||
                      std::is_same_v<T, BigBirdSparsityConfig>) {
          return builder(c, rng);
        } else {
          return builder(c);
        }
      },
      config);
}

}  // namespace

Status build_layout(const SparsityConfig& config, int64_t seq_len,
                    const LayoutBuildOptions& options, Layout* out) {
  Status valid = validate_sparsity_config(config);
  if (!valid.ok()) return valid;
  Status length = check_layout_length(config, seq_len);
  if (!length.ok()) return length;
  const SparsityCommon& common = sparsity_common(config);
  const int64_t n = seq_len / common.block;
  Layout layout = Layout::zeros(common.num_heads, n, n);
  DenseLayoutSink sink(&layout);
  Status s = paint_layout(config, seq_len, options, &sink);
  if (!s.ok()) return s;
  *out = std::move(layout);
  return Status::ok_status();
}

Status check_crop(int64_t full_rows, int64_t full_cols, int64_t block, int64_t seq_len) {
  if (block < 1) {
    return Status::invalid_argument("crop_layout: block (" + std::to_string(block) +
                                    ") must be >= 1");
  }
  const int64_t n = seq_len / block;
  if (seq_len < 1 || seq_len % block != 0 || n > full_rows || n > full_cols) {
    return Status::invalid_argument(
        "crop_layout: seq_len (" + std::to_string(seq_len) + ") must be a positive multiple of " +
        "block (" + std::to_string(block) + ") of at most " +
        std::to_string(std::min(full_rows, full_cols)) +
        " blocks, the size of the layout it is cropped from (" +
        std::to_string(std::min(full_rows, full_cols) * block) + " tokens)");
  }
  return Status::ok_status();
}

Status check_length_for_crop(int64_t max_seq_length, int64_t seq_len) {
  if (seq_len > max_seq_length) {
    return Status::invalid_argument(
        "make_layout_for_length: seq_len (" + std::to_string(seq_len) +
        ") must be <= max_seq_length (" + std::to_string(max_seq_length) +
        "): the layout for seq_len is a crop of the one built for max_seq_length");
  }
  return Status::ok_status();
}

Status build_sparse_layout_rows(const SparsityConfig& config, int64_t max_seq_length,
                                int64_t seq_len, SparseLayoutRows* out) {
  // The checks of make_layout_for_length, in its order: the lengths, make_layout's checks for
  // max_seq_length (including what painting finds), then crop_layout's.
  Status s = check_length_for_crop(max_seq_length, seq_len);
  if (!s.ok()) return s;
  s = validate_sparsity_config(config);
  if (!s.ok()) return s;
  s = check_layout_length(config, max_seq_length);
  if (!s.ok()) return s;
  const SparsityCommon& common = sparsity_common(config);
  const int64_t full = max_seq_length / common.block;
  // Rows and columns past the crop are painted (the random draws must happen) but not kept.
  const int64_t kept = std::clamp<int64_t>(seq_len / common.block, 0, full);
  SparseLayoutSink sink(common.num_heads, kept);
  s = paint_layout(config, max_seq_length, LayoutBuildOptions{}, &sink);
  if (!s.ok()) return s;
  s = check_crop(full, full, common.block, seq_len);
  if (!s.ok()) return s;
  sink.finish(out);
  return Status::ok_status();
}

}  // namespace detail

// ---- the Layout type ----

Layout Layout::zeros(int64_t num_heads, int64_t num_row_blocks, int64_t num_col_blocks) {
  Layout layout;
  layout.num_heads = num_heads;
  layout.num_row_blocks = num_row_blocks;
  layout.num_col_blocks = num_col_blocks;
  layout.blocks.assign(static_cast<size_t>(num_heads * num_row_blocks * num_col_blocks), 0);
  return layout;
}

}  // namespace sciattn

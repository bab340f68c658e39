// Helpers shared by the sparsity layout tests: layouts written as rows of 0/1 digits.
// Test layer (tests/cpu).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sciattn/block_sparse.h"

namespace sciattn::testing {

// A layout from one grid per head, each a list of equal-length rows of '0'/'1'.
inline Layout layout_from_grids(const std::vector<std::vector<std::string>>& heads) {
  const auto n = static_cast<int64_t>(heads.at(0).size());
  const auto m = static_cast<int64_t>(heads.at(0).at(0).size());
  Layout layout = Layout::zeros(static_cast<int64_t>(heads.size()), n, m);
  for (size_t h = 0; h < heads.size(); ++h) {
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < m; ++c) {
        layout.at(static_cast<int64_t>(h), r, c) = heads[h].at(r).at(c) == '1' ? 1 : 0;
      }
    }
  }
  return layout;
}

inline Layout layout_from_grid(const std::vector<std::string>& rows) {
  return layout_from_grids({rows});
}

// make_layout that must succeed.
inline Layout make_ok(const SparsityConfig& config, int64_t seq_len) {
  Layout layout;
  Status s = make_layout(config, seq_len, &layout);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return layout;
}

// Compares layouts and prints both grids on a difference.
#define SCIATTN_EXPECT_LAYOUT_EQ(actual, expected)                                            \
  EXPECT_TRUE((actual) == (expected)) << "got:\n"                                             \
                                      << ::sciattn::layout_to_string(actual) << "expected:\n" \
                                      << ::sciattn::layout_to_string(expected)

}  // namespace sciattn::testing

// Where a NaN placed in one query row must show up in the outputs and gradients of Evoformer and
// sparse attention, and where it must not: shared by the CPU suites and the GPU suites, which
// check every algorithm and device against the same rule. Test layer (tests/cpu).
//
// The rule (PyTorch's): a NaN in an input reaches every output and gradient that depends on it,
// and nothing that does not; a fully masked row (every score -inf because of a mask) still gives
// output 0, log-sum-exp -inf and zero gradients. One thing is left to the algorithm: whether a
// row's NaN also reaches the gradients of keys that the row masks or whose blocks it skips (as a
// product 0 * NaN would in PyTorch's math backend, and does not in its flash backend); the tests
// accept either there (Expect::kEither).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace sciattn::test {

// What an element must be.
enum class Expect { kFinite, kNaN, kEither };

// Checks every values[i] against expect(i); lists the first few elements that break the rule.
inline ::testing::AssertionResult nan_where(const std::string& what,
                                            const std::vector<double>& values,
                                            const std::function<Expect(int64_t)>& expect) {
  int64_t wrong = 0;
  std::string examples;
  for (int64_t i = 0; i < static_cast<int64_t>(values.size()); ++i) {
    const double v = values[static_cast<size_t>(i)];
    const Expect e = expect(i);
    const bool ok = e == Expect::kEither || (e == Expect::kNaN ? std::isnan(v) : std::isfinite(v));
    if (ok) continue;
    if (++wrong <= 4) {
      examples += " [" + std::to_string(i) + "]=" + std::to_string(v) +
                  (e == Expect::kNaN ? " (want NaN)" : " (want finite)");
    }
  }
  if (wrong == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": " << wrong << " of " << values.size()
                                       << " elements break the NaN rule:" << examples;
}

// NaN exactly where nan_at(i) holds, finite elsewhere.
inline ::testing::AssertionResult nan_exactly_where(const std::string& what,
                                                    const std::vector<double>& values,
                                                    const std::function<bool(int64_t)>& nan_at) {
  return nan_where(what, values,
                   [&](int64_t i) { return nan_at(i) ? Expect::kNaN : Expect::kFinite; });
}

// The coordinates of linear index i of a packed row-major tensor of `sizes`.
inline std::vector<int64_t> unravel(int64_t i, const std::vector<int64_t>& sizes) {
  std::vector<int64_t> at(sizes.size());
  for (size_t k = sizes.size(); k-- > 0;) {
    at[k] = i % sizes[k];
    i /= sizes[k];
  }
  return at;
}

}  // namespace sciattn::test

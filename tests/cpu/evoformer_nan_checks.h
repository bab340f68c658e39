// The NaN case of Evoformer attention that the CPU and GPU suites share: a NaN in one element of
// q and where it must show up (nan_semantics_util.h). Test layer (tests/cpu).
#pragma once

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "evoformer_test_util.h"
#include "nan_semantics_util.h"

namespace sciattn::test {

// [B, N, L, H, D] = [2, 2, 150, 2, `dim`]: L spans two key tiles of the CPU's tiled path and of
// the GPU's 64-key tiles, and is not a multiple of either. Both biases are present, so dbias1 and
// dbias2 are checked too.
inline EvoConfig evoformer_nan_config(DType dtype, int64_t dim = 8) {
  EvoConfig cfg;
  cfg.shape = {2, 2, 150, 2, dim};
  cfg.dtype = dtype;
  cfg.bias1 = Bias1Kind::kSameAsQ;
  cfg.bias2 = Bias2Kind::kSameAsQ;
  cfg.seed = kBaseSeed + 3800;
  return cfg;
}

// The spot that gets the NaN: q[b=1, n=0, i=77, h=1, d=3].
struct EvoNanSpot {
  static constexpr int64_t kB = 1, kN = 0, kI = 77, kH = 1, kD = 3;
};

inline void put_nan_in_q(EvoInputs& in) {
  using S = EvoNanSpot;
  in.q.set(static_cast<int64_t>(qkv_at(in.cfg.shape, S::kB, S::kN, S::kI, S::kH, S::kD)),
           std::numeric_limits<double>::quiet_NaN());
}

// The forward's out and lse: NaN in the spot's row, finite everywhere else.
inline void expect_forward_nan_in_row(const EvoShape& s, const std::vector<double>& out,
                                      const std::vector<double>& lse) {
  using S = EvoNanSpot;
  EXPECT_TRUE(nan_exactly_where("out", out, [&](int64_t i) {
    const auto x = unravel(i, s.qkv());
    return x[0] == S::kB && x[1] == S::kN && x[2] == S::kI && x[3] == S::kH;
  }));
  EXPECT_TRUE(nan_exactly_where("lse", lse, [&](int64_t i) {
    const auto x = unravel(i, s.lse());
    return x[0] == S::kB * s.N + S::kN && x[1] == S::kH && x[2] == S::kI;
  }));
}

// The backward: dQ of the row; dK and dV of every key of its (b, n, h) slice (each is attended by
// the row); dbias1 of (b, n), which sums dS over heads and rows; dbias2 of (b, h, i), which sums
// it over n. Finite everywhere else.
inline void expect_backward_nan_from_row(const EvoShape& s, const std::vector<double>& dq,
                                         const std::vector<double>& dk,
                                         const std::vector<double>& dv,
                                         const std::vector<double>& dbias1,
                                         const std::vector<double>& dbias2) {
  using S = EvoNanSpot;
  auto in_slice = [&](const std::vector<int64_t>& x) {
    return x[0] == S::kB && x[1] == S::kN && x[3] == S::kH;
  };
  EXPECT_TRUE(nan_exactly_where("dq", dq, [&](int64_t i) {
    const auto x = unravel(i, s.qkv());
    return in_slice(x) && x[2] == S::kI;
  }));
  EXPECT_TRUE(
      nan_exactly_where("dk", dk, [&](int64_t i) { return in_slice(unravel(i, s.qkv())); }));
  EXPECT_TRUE(
      nan_exactly_where("dv", dv, [&](int64_t i) { return in_slice(unravel(i, s.qkv())); }));
  EXPECT_TRUE(nan_exactly_where("dbias1", dbias1, [&](int64_t i) {
    const auto x = unravel(i, s.bias1());
    return x[0] == S::kB && x[1] == S::kN;
  }));
  EXPECT_TRUE(nan_exactly_where("dbias2", dbias2, [&](int64_t i) {
    const auto x = unravel(i, s.bias2());
    return x[0] == S::kB && x[2] == S::kH && x[3] == S::kI;
  }));
}

}  // namespace sciattn::test

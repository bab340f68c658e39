// Tests of the int32 packing of index arrays for the device upload (src/common/int32_packer.h):
// offsets on 16-byte boundaries, every value and every padding element written, and values
// outside int32 refused. Test layer (tests/cpu).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/int32_packer.h"

namespace sciattn {
namespace {

using detail::Int32Packer;

TEST(Int32Packer, ArraysLandAlignedWithZeroPadding) {
  std::mt19937_64 rng(20261201);
  std::vector<std::vector<int64_t>> arrays;
  for (size_t n : {0, 1, 3, 4, 5, 0, 7, 1000, 2}) {
    std::vector<int64_t> a(n);
    for (auto& v : a) {
      v = static_cast<int64_t>(rng() % (uint64_t{1} << 32)) - (int64_t{1} << 31);  // all of int32
    }
    arrays.push_back(a);
  }
  Int32Packer packer;
  std::vector<size_t> offsets;
  for (const auto& a : arrays) offsets.push_back(packer.add(a));
  // A buffer full of garbage: every element must be written.
  std::vector<int32_t> out(packer.size(), 0x5a5a5a5a);
  ASSERT_TRUE(packer.pack(out.data()));
  ASSERT_EQ(packer.size() % 4, 0u);
  std::vector<bool> written(packer.size(), false);
  for (size_t k = 0; k < arrays.size(); ++k) {
    EXPECT_EQ(offsets[k] % 4, 0u) << "array " << k;
    if (k > 0) {
      EXPECT_GE(offsets[k], offsets[k - 1] + arrays[k - 1].size()) << "overlap";
    }
    for (size_t i = 0; i < arrays[k].size(); ++i) {
      EXPECT_EQ(out[offsets[k] + i], static_cast<int32_t>(arrays[k][i])) << k << ", " << i;
      written[offsets[k] + i] = true;
    }
  }
  for (size_t i = 0; i < packer.size(); ++i) {
    if (!written[i]) {
      EXPECT_EQ(out[i], 0) << "padding element " << i;
    }
  }
  // Padding only where needed: the buffer ends with the last array, rounded up to 4.
  EXPECT_EQ(packer.size(), (offsets.back() + arrays.back().size() + 3) / 4 * 4);
}

TEST(Int32Packer, RefusesValuesOutsideInt32) {
  for (int64_t bad : {int64_t{std::numeric_limits<int32_t>::max()} + 1,
                      int64_t{std::numeric_limits<int32_t>::min()} - 1,
                      std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()}) {
    const std::vector<int64_t> ok = {1, 2, 3}, with_bad = {0, bad, 5};
    Int32Packer packer;
    packer.add(ok);
    packer.add(with_bad);
    std::vector<int32_t> out(packer.size());
    EXPECT_FALSE(packer.pack(out.data())) << bad;
  }
  const std::vector<int64_t> edges = {std::numeric_limits<int32_t>::max(),
                                      std::numeric_limits<int32_t>::min()};
  Int32Packer packer;
  packer.add(edges);
  std::vector<int32_t> out(packer.size());
  ASSERT_TRUE(packer.pack(out.data()));
  EXPECT_EQ(out[0], std::numeric_limits<int32_t>::max());
  EXPECT_EQ(out[1], std::numeric_limits<int32_t>::min());
}

TEST(Int32Packer, NothingRegisteredPacksNothing) {
  Int32Packer packer;
  int32_t untouched = 7;
  EXPECT_TRUE(packer.pack(&untouched));
  EXPECT_EQ(packer.size(), 0u);
  EXPECT_EQ(untouched, 7);
}

}  // namespace
}  // namespace sciattn

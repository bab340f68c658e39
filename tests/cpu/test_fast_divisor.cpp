// The CUDA kernels' grid decoding by multiply-high (src/cuda/common/fast_divisor.h), checked on the
// host against the divide instruction: every divisor up to 4,096 and the powers of two and their
// neighbours up to 2^30, at the smallest and largest dividends and around every multiple near
// them, plus random dividends below 2^31.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda/common/fast_divisor.h"

namespace {

using sciattn::cuda::fast_divide;
using sciattn::cuda::fast_divmod;
using sciattn::cuda::make_fast_divisor;

constexpr uint32_t kLargest = (uint32_t{1} << 31) - 1;

void check_divisor(uint32_t d, std::mt19937& rng) {
  const auto f = make_fast_divisor(d);
  std::vector<uint32_t> xs = {0, 1, d - 1, d, d + 1, kLargest, kLargest - 1};
  // Around the largest multiples of d (where the multiplier's error is largest).
  const uint32_t top = kLargest / d * d;
  for (uint32_t k = 0; k < 3 && top >= k * d; ++k) {
    const uint32_t m = top - k * d;
    xs.push_back(m);
    if (m > 0) xs.push_back(m - 1);
    if (m < kLargest) xs.push_back(m + 1);
  }
  std::uniform_int_distribution<uint32_t> any(0, kLargest);
  for (int i = 0; i < 64; ++i) xs.push_back(any(rng));
  for (uint32_t x : xs) {
    ASSERT_EQ(fast_divide(x, f), x / d) << "x = " << x << ", d = " << d;
    const auto qr = fast_divmod(x, f);
    ASSERT_EQ(qr.quotient, x / d);
    ASSERT_EQ(qr.remainder, x % d) << "x = " << x << ", d = " << d;
  }
}

TEST(FastDivisor, SmallDivisors) {
  std::mt19937 rng(7);
  for (uint32_t d = 1; d <= 4096; ++d) check_divisor(d, rng);
}

TEST(FastDivisor, PowersOfTwoAndNeighbours) {
  std::mt19937 rng(11);
  for (int s = 1; s <= 30; ++s) {
    const uint32_t p = uint32_t{1} << s;
    for (uint32_t d : {p - 1, p, p + 1}) check_divisor(d, rng);
  }
  check_divisor(kLargest, rng);
}

TEST(FastDivisor, RandomDivisors) {
  std::mt19937 rng(13);
  std::uniform_int_distribution<uint32_t> any(1, kLargest);
  for (int i = 0; i < 2000; ++i) check_divisor(any(rng), rng);
}

}  // namespace

// vector_exp (src/cpu/vector_exp.h), the CPU softmax loops' exponential: within 2 ulp of the
// correctly rounded exp over the whole float range that does not overflow, exact at 0, and the
// special values the softmax code relies on. Run through a cloned loop, as the kernels run it
// (the clone this CPU gets, FMA contraction included).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/vector_exp.h"

namespace {

using sciattn::cpu::exp_shifted_row;
using sciattn::cpu::vector_exp;

SCIATTN_CPU_CLONES void exp_all(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = vector_exp(x[i]);
}

SCIATTN_CPU_CLONES float exp_row(float* row, int64_t n, float shift) {
  return exp_shifted_row(row, n, shift);
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
int64_t ordered(float f) {  // an integer that counts floats in order (-0 and +0 both 0)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return (u & 0x80000000u) ? -static_cast<int64_t>(u & 0x7fffffffu) : static_cast<int64_t>(u);
}

// Every 97th float from -110 to 88.7 (about 23 million, both signs, the subnormal results
// included): at most 2 ulp from exp rounded to float, as distance in representable floats.
TEST(CpuVectorExp, WithinTwoUlpOverTheRange) {
  std::vector<float> x;
  for (uint32_t u = 0; u <= 0x42B17217u; u += 97) x.push_back(from_bits(u));  // 0 .. 88.72
  for (uint32_t u = 0x80000000u; u <= 0xC2DC0000u; u += 97)
    x.push_back(from_bits(u));  // -0 .. -110
  std::vector<float> y(x.size());
  exp_all(x.data(), y.data(), static_cast<int64_t>(x.size()));
  int64_t worst = 0;
  float worst_x = 0.0f;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = static_cast<float>(std::exp(static_cast<double>(x[i])));
    const int64_t ulp = std::llabs(ordered(y[i]) - ordered(want));
    if (ulp > worst) {
      worst = ulp;
      worst_x = x[i];
    }
  }
  EXPECT_LE(worst, 2) << "at x = " << worst_x;
}

TEST(CpuVectorExp, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {0.0f,   -0.0f, -inf,   inf,    std::nanf(""), -104.0f,
                                -1e30f, 1e30f, 88.72f, 88.73f, 89.5f,         -87.0f};
  std::vector<float> y(x.size());
  exp_all(x.data(), y.data(), static_cast<int64_t>(x.size()));
  EXPECT_EQ(y[0], 1.0f);  // the row maximum's own term is exactly 1
  EXPECT_EQ(y[1], 1.0f);
  EXPECT_EQ(y[2], 0.0f);  // a masked key
  EXPECT_FALSE(std::signbit(y[2]));
  EXPECT_EQ(y[3], inf);
  EXPECT_TRUE(std::isnan(y[4]));  // NaN reaches the outputs
  EXPECT_EQ(y[5], 0.0f);
  EXPECT_EQ(y[6], 0.0f);
  EXPECT_EQ(y[7], inf);
  EXPECT_TRUE(std::isfinite(y[8]));
  EXPECT_EQ(y[9], inf);
  EXPECT_EQ(y[10], inf);
  EXPECT_GT(y[11], 0.0f);
}

// exp_shifted_row: each element exp(x - shift), the sum added in order.
TEST(CpuVectorExp, ShiftedRowAndItsSum) {
  std::vector<float> row = {1.0f, 3.0f, -std::numeric_limits<float>::infinity(), 2.5f, 3.0f};
  std::vector<float> want(row.size());
  for (size_t i = 0; i < row.size(); ++i) want[i] = std::exp(row[i] - 3.0f);
  const float sum = exp_row(row.data(), static_cast<int64_t>(row.size()), 3.0f);
  float want_sum = 0.0f;
  for (size_t i = 0; i < row.size(); ++i) {
    EXPECT_NEAR(row[i], want[i], 2e-7f * want[i]) << i;
    want_sum += row[i];
  }
  EXPECT_EQ(row[1], 1.0f);
  EXPECT_EQ(row[2], 0.0f);
  EXPECT_EQ(sum, want_sum);
}

}  // namespace

// The exponential of the CPU softmax loops (tiled Evoformer, fused block-sparse attention,
// block-sparse Softmax), written as straight-line float and integer arithmetic so that a loop over
// a row of scores vectorises: std::exp is a libm call per element, and it was about half of the
// tiled Evoformer forward's time (5.8 ns of a score's 11.7 at head dim 32). The CPU references
// keep std::exp: they are the specification this is tested against. CPU layer.
//
// exp(x) = 2^k e^r with k = round(x / ln 2) and r = x - k ln 2 in [-ln 2 / 2, ln 2 / 2] (ln 2 in
// two parts, so that k ln 2's high part is exact), e^r by its Taylor polynomial of degree 7
// (truncation error below 6e-9 relative), 2^k applied as two powers of two so that results down
// to the subnormals round once. Every x gives what the softmax code relies on: exp(0) = 1
// exactly, exp(-inf) = +0 (a masked key), a NaN stays NaN, exp(x) = +inf from x = 88.73 on and +0
// below about -103.97; elsewhere the result is within 2 ulp of std::exp's (tested over every
// float exponent range in test_cpu_vector_exp).
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu/cpu_clones.h"

namespace sciattn::cpu {

SCIATTN_CPU_INLINE float vector_exp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2High = 0.693145751953125f;  // 16 significant bits: k * kLn2High is exact
  constexpr float kLn2Low = 1.428606765330187045e-06f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  // The comparisons are false for NaN, which therefore passes through to the result.
  float t = x < -104.0f ? -104.0f : x;
  t = t > 89.0f ? 89.0f : t;
  const float shifted = t * kLog2e + kRound;
  uint32_t shifted_bits, round_bits;
  std::memcpy(&shifted_bits, &shifted, 4);
  std::memcpy(&round_bits, &kRound, 4);
  const int32_t k = static_cast<int32_t>(shifted_bits - round_bits);  // in [-151, 129]
  const float kf = shifted - kRound;
  const float r = (t - kf * kLn2High) - kf * kLn2Low;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^k = 2^k1 2^k2, each factor a normal float (k1, k2 in [-76, 65]).
  const int32_t k1 = k >> 1, k2 = k - k1;
  const uint32_t scale1_bits = static_cast<uint32_t>(k1 + 127) << 23;
  const uint32_t scale2_bits = static_cast<uint32_t>(k2 + 127) << 23;
  float scale1, scale2;
  std::memcpy(&scale1, &scale1_bits, 4);
  std::memcpy(&scale2, &scale2_bits, 4);
  return p * scale1 * scale2;
}

// row[c] = exp(row[c] - shift) for c in [0, n) (vectorised); returns their sum, added in order.
SCIATTN_CPU_INLINE float exp_shifted_row(float* row, int64_t n, float shift) {
  for (int64_t c = 0; c < n; ++c) row[c] = vector_exp(row[c] - shift);
  float sum = 0.0f;
  for (int64_t c = 0; c < n; ++c) sum += row[c];
  return sum;
}

}  // namespace sciattn::cpu

// Division by a divisor fixed for a launch, as a multiply-high, an add and a shift (no divide
// instruction exists on the GPU: `x / d` for a run-time d is a ~20-instruction sequence on the
// vector pipe). Used to decode a 1-D grid index into its coordinates: computed from the block
// index and launch constants only, the quotients stay in the uniform datapath, and so do the
// per-CTA addresses derived from them. CUDA layer; host and device.
//
// For a divisor d >= 1 let s = ceil(log2 d) and m = floor(2^32 (2^s - d) / d) + 1 (< 2^32), so
// that 2^32 + m = floor(2^(32+s) / d) + 1 = 2^(32+s) / d + e with 0 < e <= 1. Then
// (floor(x m / 2^32) + x) >> s = floor(x (2^32 + m) / 2^(32+s)) = floor(x / d + x e / 2^(32+s)),
// and for x < 2^31 the added term is below 2^-(s+1) <= 1 / (2d): too small to reach the next
// integer, since x / d is at most (d - 1) / d past one. x < 2^31 also keeps the sum in 32 bits.
// (The round-up method of Granlund and Montgomery; tests/cpu/test_fast_divisor.cpp checks it.)
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define SCIATTN_HOST_DEVICE __host__ __device__
#else
#define SCIATTN_HOST_DEVICE
#endif

namespace sciattn::cuda {

struct FastDivisor {
  uint32_t divisor = 1;
  uint32_t multiplier = 1;  // m above (1 for d = 1, where s = 0: floor(x / 2^32) + x = x)
  uint32_t shift = 0;
};

// d must be in [1, 2^31).
inline FastDivisor make_fast_divisor(uint32_t d) {
  FastDivisor f;
  f.divisor = d;
  uint32_t s = 0;
  while ((uint64_t{1} << s) < d) ++s;
  f.shift = s;
  f.multiplier = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << s) - d)) / d + 1);
  return f;
}

// floor(x / f.divisor) for x < 2^31.
SCIATTN_HOST_DEVICE inline uint32_t fast_divide(uint32_t x, const FastDivisor& f) {
#ifdef __CUDA_ARCH__
  const uint32_t high = __umulhi(x, f.multiplier);
#else
  const uint32_t high = static_cast<uint32_t>((uint64_t{x} * f.multiplier) >> 32);
#endif
  return (high + x) >> f.shift;
}

// x = quotient * divisor + remainder.
struct QuotientRemainder {
  uint32_t quotient, remainder;
};
SCIATTN_HOST_DEVICE inline QuotientRemainder fast_divmod(uint32_t x, const FastDivisor& f) {
  const uint32_t q = fast_divide(x, f);
  return {q, x - q * f.divisor};
}

}  // namespace sciattn::cuda

#undef SCIATTN_HOST_DEVICE

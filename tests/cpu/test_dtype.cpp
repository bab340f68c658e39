// Tests of the public element types (dtype.h) and the small core-type helpers: exact
// float <-> f16 / bf16 conversions against an independent rounding oracle. Test layer (tests/cpu).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "evoformer_test_util.h"
#include "sciattn/device.h"
#include "sciattn/dtype.h"
#include "sciattn/status.h"

namespace sciattn {
namespace {

using test::kBaseSeed;
using test::seed_note;

// ---- An independent model of the two 16-bit formats, written with ldexp in double. ----

// Decodes an IEEE binary16 pattern: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
double ref_f16_to_double(uint16_t h) {
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  double mag;
  if (e == 0x1f) {
    mag =
        m != 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    mag = std::ldexp(static_cast<double>(m), -24);  // subnormal: m * 2^-24
  } else {
    mag = std::ldexp(static_cast<double>(1024 + m), e - 25);  // (1 + m/2^10) * 2^(e-15)
  }
  return (h & 0x8000) ? -mag : mag;
}

// Decodes a bfloat16 pattern: 1 sign, 8 exponent (bias 127), 7 mantissa bits.
double ref_bf16_to_double(uint16_t h) {
  const int e = (h >> 7) & 0xff;
  const int m = h & 0x7f;
  double mag;
  if (e == 0xff) {
    mag =
        m != 0 ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (e == 0) {
    mag = std::ldexp(static_cast<double>(m), -133);  // subnormal: m * 2^-133
  } else {
    mag = std::ldexp(static_cast<double>(128 + m), e - 134);  // (1 + m/2^7) * 2^(e-127)
  }
  return (h & 0x8000) ? -mag : mag;
}

// Round-to-nearest-even by search: the positive finite values of a 16-bit format, in increasing
// order, are the patterns 0 .. max_finite. A value is rounded to the nearer of its two
// neighbours in that table; on a tie the one with the even pattern (mantissa LSB 0) wins. One
// past the largest finite value sits the next power of two, with the infinity pattern (which is
// even): a value at or beyond the midpoint to it rounds to infinity, as IEEE 754 requires.
class RoundingOracle {
 public:
  RoundingOracle(double (*decode)(uint16_t), uint16_t max_finite, double beyond) {
    for (uint32_t p = 0; p <= max_finite; ++p) values_.push_back(decode(static_cast<uint16_t>(p)));
    values_.push_back(beyond);  // the pattern max_finite + 1 is +inf
  }

  // Rounds a finite or infinite double; NaN is handled by the caller.
  uint16_t round(double x) const {
    const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
    const double a = std::fabs(x);
    const size_t inf_index = values_.size() - 1;
    if (a >= values_.back()) return static_cast<uint16_t>(sign | inf_index);
    // The last index whose value is <= a; values_[0] == 0 so it always exists.
    const size_t lo =
        static_cast<size_t>(std::upper_bound(values_.begin(), values_.end(), a) - values_.begin()) -
        1;
    if (values_[lo] == a) return static_cast<uint16_t>(sign | lo);
    const double d_lo = a - values_[lo];
    const double d_hi = values_[lo + 1] - a;
    size_t pick;
    if (d_lo < d_hi) {
      pick = lo;
    } else if (d_hi < d_lo) {
      pick = lo + 1;
    } else {
      pick = (lo % 2 == 0) ? lo : lo + 1;
    }
    return static_cast<uint16_t>(sign | pick);
  }

  // Midpoints between neighbouring positive values (the rounding ties), as exact doubles.
  std::vector<double> midpoints() const {
    std::vector<double> m;
    for (size_t i = 0; i + 1 < values_.size(); ++i)
      m.push_back(0.5 * (values_[i] + values_[i + 1]));
    return m;
  }

 private:
  std::vector<double> values_;
};

const RoundingOracle& f16_oracle() {
  static const RoundingOracle oracle(ref_f16_to_double, 0x7bff, 65536.0);
  return oracle;
}
const RoundingOracle& bf16_oracle() {
  static const RoundingOracle oracle(ref_bf16_to_double, 0x7f7f, std::ldexp(1.0, 128));
  return oracle;
}

bool is_f16_nan(uint16_t h) {
  return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}
bool is_bf16_nan(uint16_t h) {
  return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0;
}

std::string hex(uint32_t u) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", u);
  return buf;
}

// Checks float_to_f16_bits and float_to_bf16_bits of one float against the oracles. Returns the
// number of mismatches (0 or 1 per format) and records a failure for the first few.
int check_float(float f, int* reported) {
  int bad = 0;
  const uint16_t h = float_to_f16_bits(f);
  const uint16_t b = float_to_bf16_bits(f);
  if (std::isnan(f)) {
    bad += is_f16_nan(h) ? 0 : 1;
    bad += is_bf16_nan(b) ? 0 : 1;
  } else {
    const uint16_t want_h = f16_oracle().round(static_cast<double>(f));
    const uint16_t want_b = bf16_oracle().round(static_cast<double>(f));
    if (h != want_h) {
      ++bad;
      if ((*reported)++ < 10) {
        ADD_FAILURE() << "float_to_f16_bits(" << hex(float_bits(f)) << " = " << f
                      << ") = " << hex(h) << ", expected " << hex(want_h);
      }
    }
    if (b != want_b) {
      ++bad;
      if ((*reported)++ < 10) {
        ADD_FAILURE() << "float_to_bf16_bits(" << hex(float_bits(f)) << " = " << f
                      << ") = " << hex(b) << ", expected " << hex(want_b);
      }
    }
  }
  return bad;
}

// ---- Decoding and round trips, exhaustive over all 65536 patterns. ----

TEST(DTypeConversion, F16DecodeMatchesIndependentModelForAllPatterns) {
  for (uint32_t p = 0; p <= 0xffff; ++p) {
    const uint16_t h = static_cast<uint16_t>(p);
    const double want = ref_f16_to_double(h);
    const float got = f16_bits_to_float(h);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << hex(p);
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << hex(p);
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << hex(p);  // -0 stays -0
    }
  }
}

TEST(DTypeConversion, BF16DecodeMatchesIndependentModelForAllPatterns) {
  for (uint32_t p = 0; p <= 0xffff; ++p) {
    const uint16_t h = static_cast<uint16_t>(p);
    const double want = ref_bf16_to_double(h);
    const float got = bf16_bits_to_float(h);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << hex(p);
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << hex(p);
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << hex(p);
    }
  }
}

// Every 16-bit value is exactly representable in float, so bits -> float -> bits must be the
// identity; a NaN pattern must come back as some NaN of the same sign.
TEST(DTypeConversion, F16RoundTripIsIdentityForAllPatterns) {
  for (uint32_t p = 0; p <= 0xffff; ++p) {
    const uint16_t h = static_cast<uint16_t>(p);
    const uint16_t back = float_to_f16_bits(f16_bits_to_float(h));
    if (is_f16_nan(h)) {
      ASSERT_TRUE(is_f16_nan(back)) << hex(p) << " -> " << hex(back);
      ASSERT_EQ(back & 0x8000, h & 0x8000) << hex(p);
    } else {
      ASSERT_EQ(back, h) << hex(p);
    }
  }
}

TEST(DTypeConversion, BF16RoundTripIsIdentityForAllPatterns) {
  for (uint32_t p = 0; p <= 0xffff; ++p) {
    const uint16_t h = static_cast<uint16_t>(p);
    const uint16_t back = float_to_bf16_bits(bf16_bits_to_float(h));
    if (is_bf16_nan(h)) {
      ASSERT_TRUE(is_bf16_nan(back)) << hex(p) << " -> " << hex(back);
      ASSERT_EQ(back & 0x8000, h & 0x8000) << hex(p);
    } else {
      ASSERT_EQ(back, h) << hex(p);
    }
  }
}

// ---- Rounding of specific values. ----

TEST(DTypeConversion, F16TiesRoundToEven) {
  // 1 + 2^-11 lies halfway between 1 (mantissa 0) and 1 + 2^-10 (mantissa 1): even is 1.
  EXPECT_EQ(float_to_f16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  // 1 + 3 * 2^-11 lies halfway between mantissas 1 and 2: even is 2.
  EXPECT_EQ(float_to_f16_bits(1.0f + 3.0f * std::ldexp(1.0f, -11)), 0x3c02);
  // Just above a tie rounds up, just below rounds down.
  EXPECT_EQ(float_to_f16_bits(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  EXPECT_EQ(float_to_f16_bits(std::nextafter(1.0f + 3.0f * std::ldexp(1.0f, -11), 0.0f)), 0x3c01);
  // Integers: above 2048 the spacing is 2, so 2049 ties to 2048 and 2051 to 2052.
  EXPECT_EQ(f16_bits_to_float(float_to_f16_bits(2049.0f)), 2048.0f);
  EXPECT_EQ(f16_bits_to_float(float_to_f16_bits(2051.0f)), 2052.0f);
  EXPECT_EQ(f16_bits_to_float(float_to_f16_bits(-2051.0f)), -2052.0f);
  // A tie whose even neighbour is in the next binade: below 2048 the spacing is 1, so 2047.5
  // ties between 2047 (odd mantissa 0x3ff) and 2048 (even), and rounding carries the exponent.
  EXPECT_EQ(f16_bits_to_float(float_to_f16_bits(2047.5f)), 2048.0f);
}

TEST(DTypeConversion, F16OverflowAndLargestFinite) {
  EXPECT_EQ(float_to_f16_bits(65504.0f), 0x7bff);  // the largest finite half
  // 65520 is the midpoint between 65504 and 65536 (= 2^16, not representable); the tie goes to
  // the even pattern, which is infinity.
  EXPECT_EQ(float_to_f16_bits(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_f16_bits(-65520.0f), 0xfc00);
  // The float just below 65520 (65519.99609375) rounds down to 65504.
  EXPECT_EQ(float_to_f16_bits(65519.99f), 0x7bff);
  EXPECT_EQ(float_to_f16_bits(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(float_to_f16_bits(1e10f), 0x7c00);
  EXPECT_EQ(float_to_f16_bits(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(float_to_f16_bits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_f16_bits(-std::numeric_limits<float>::infinity()), 0xfc00);
  // OpenFold's mask bias 1e9 * (mask - 1) is -inf in f16.
  EXPECT_EQ(float_to_f16_bits(-1e9f), 0xfc00);
}

TEST(DTypeConversion, F16Subnormals) {
  const float tiny = std::ldexp(1.0f, -24);  // the smallest subnormal half
  EXPECT_EQ(float_to_f16_bits(tiny), 0x0001);
  EXPECT_EQ(float_to_f16_bits(-tiny), 0x8001);
  EXPECT_EQ(float_to_f16_bits(0.5f * tiny), 0x0000);   // tie between 0 and 1: even 0
  EXPECT_EQ(float_to_f16_bits(-0.5f * tiny), 0x8000);  // -0 keeps its sign
  EXPECT_EQ(float_to_f16_bits(std::nextafter(0.5f * tiny, 1.0f)), 0x0001);
  EXPECT_EQ(float_to_f16_bits(1.5f * tiny), 0x0002);  // tie between 1 and 2: even 2
  EXPECT_EQ(float_to_f16_bits(2.5f * tiny), 0x0002);  // tie between 2 and 3: even 2
  EXPECT_EQ(float_to_f16_bits(0.25f * tiny), 0x0000);
  EXPECT_EQ(float_to_f16_bits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_f16_bits(1023.0f * tiny), 0x03ff);  // the largest subnormal
  // 1023.5 * 2^-24 ties between the largest subnormal (odd) and the smallest normal (even).
  EXPECT_EQ(float_to_f16_bits(1023.5f * tiny), 0x0400);
  EXPECT_EQ(float_to_f16_bits(std::nextafter(1023.5f * tiny, 0.0f)), 0x03ff);
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -14)), 0x0400);  // the smallest normal
  EXPECT_EQ(f16_bits_to_float(0x0001), tiny);
  EXPECT_EQ(f16_bits_to_float(0x03ff), 1023.0f * tiny);
  EXPECT_EQ(float_to_f16_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_f16_bits(-0.0f), 0x8000);
}

TEST(DTypeConversion, BF16TiesOverflowAndSubnormals) {
  // 1 + 2^-8 ties between mantissas 0 and 1 of [1, 2): even is 0.
  EXPECT_EQ(float_to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(1.0f + 3.0f * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(float_to_bf16_bits(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)), 0x3f81);
  // The largest finite bf16 is 0x7f7f; floats past the midpoint to 2^128 round to infinity and
  // the midpoint itself ties to the even pattern 0x7f80 (infinity).
  EXPECT_EQ(float_to_bf16_bits(bits_float(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(float_to_bf16_bits(bits_float(0x7f7f8000u)), 0x7f80);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(float_to_bf16_bits(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::infinity()), 0x7f80);
  // Float subnormals round on the same 16 dropped bits.
  EXPECT_EQ(float_to_bf16_bits(bits_float(0x00008000u)), 0x0000);  // tie to even 0
  EXPECT_EQ(float_to_bf16_bits(bits_float(0x00018000u)), 0x0002);  // tie to even 2
  EXPECT_EQ(float_to_bf16_bits(bits_float(0x00008001u)), 0x0001);
  EXPECT_EQ(float_to_bf16_bits(bits_float(0x807fffffu)), 0x8080);  // carries into the normals
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
}

TEST(DTypeConversion, NaNStaysNaN) {
  // Quiet and signalling NaNs of both signs, including payloads that live only in the low bits
  // that the 16-bit formats drop (a naive truncation would turn 0x7f800001 into infinity).
  for (uint32_t u : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7f801000u, 0x7fbfffffu,
                     0x7fffffffu, 0x7f802000u}) {
    const float f = bits_float(u);
    ASSERT_TRUE(std::isnan(f));
    EXPECT_TRUE(is_f16_nan(float_to_f16_bits(f))) << hex(u) << " -> " << hex(float_to_f16_bits(f));
    EXPECT_TRUE(is_bf16_nan(float_to_bf16_bits(f)))
        << hex(u) << " -> " << hex(float_to_bf16_bits(f));
    EXPECT_TRUE(std::isnan(round_to(DType::kF16, f)));
    EXPECT_TRUE(std::isnan(round_to(DType::kBF16, f)));
  }
}

// ---- Against the oracle: every tie point and its neighbours, then many random floats. ----

// Every midpoint between two neighbouring 16-bit values is exact in float (12 or 9 significant
// bits), so each tie and the floats on either side of it can be tested directly.
TEST(DTypeConversion, AllTiePointsMatchOracle) {
  int reported = 0;
  int64_t bad = 0, checked = 0;
  for (const RoundingOracle* oracle : {&f16_oracle(), &bf16_oracle()}) {
    for (double m : oracle->midpoints()) {
      const float f = static_cast<float>(m);
      if (static_cast<double>(f) != m) continue;  // beyond float range (bf16 max to 2^128)
      for (float x : {f, std::nextafter(f, 0.0f),
                      std::nextafter(f, std::numeric_limits<float>::infinity())}) {
        bad += check_float(x, &reported);
        bad += check_float(-x, &reported);
        checked += 2;
      }
    }
  }
  EXPECT_EQ(bad, 0) << "of " << checked << " floats";
}

TEST(DTypeConversion, RandomFloatsMatchOracle) {
  const uint64_t seed = kBaseSeed + 1;
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  int reported = 0;
  int64_t bad = 0;
  constexpr int kSamples = 1000000;
  // Uniform bit patterns cover every exponent, NaN and infinity included (mostly outside the
  // f16 range, which exercises overflow and underflow to zero).
  for (int i = 0; i < kSamples; ++i)
    bad += check_float(bits_float(static_cast<uint32_t>(rng())), &reported);
  // Floats with exponents around the f16 range (subnormal to overflow) and random mantissas.
  std::uniform_int_distribution<int> exp_dist(127 - 27, 127 + 17);
  for (int i = 0; i < kSamples; ++i) {
    const uint32_t sign = static_cast<uint32_t>(rng() & 1) << 31;
    const uint32_t e = static_cast<uint32_t>(exp_dist(rng)) << 23;
    const uint32_t m = static_cast<uint32_t>(rng()) & 0x7fffffu;
    bad += check_float(bits_float(sign | e | m), &reported);
  }
  EXPECT_EQ(bad, 0);
}

// ---- The element helpers used by every op. ----

TEST(DTypeHelpers, LoadStoreAndRoundTo) {
  const uint64_t seed = kBaseSeed + 2;
  SCOPED_TRACE(seed_note(seed));
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, 100.0f);
  std::vector<uint32_t> buf(8, 0);
  for (int i = 0; i < 10000; ++i) {
    const float x = dist(rng);
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      store_from_float(buf.data(), t, 3, x);
      const float back = load_as_float(buf.data(), t, 3);
      ASSERT_EQ(float_bits(back), float_bits(round_to(t, x))) << dtype_name(t) << " " << x;
    }
    ASSERT_EQ(float_bits(round_to(DType::kF32, x)), float_bits(x));
    ASSERT_EQ(float_bits(round_to(DType::kF16, x)),
              float_bits(f16_bits_to_float(float_to_f16_bits(x))));
    ASSERT_EQ(float_bits(round_to(DType::kBF16, x)),
              float_bits(bf16_bits_to_float(float_to_bf16_bits(x))));
  }
  // Stores write exactly one element of the dtype's size and leave the neighbours alone.
  std::vector<uint16_t> halves(4, 0xabcd);
  store_from_float(halves.data(), DType::kF16, 1, 1.0f);
  EXPECT_EQ(halves[0], 0xabcd);
  EXPECT_EQ(halves[1], 0x3c00);
  EXPECT_EQ(halves[2], 0xabcd);
  store_from_float(halves.data(), DType::kBF16, 2, -2.0f);
  EXPECT_EQ(halves[2], 0xc000);
  EXPECT_EQ(halves[3], 0xabcd);
  // A boolean is one byte, 0 for false; any nonzero byte reads as true.
  std::vector<uint8_t> bools = {0, 1, 7, 0};
  EXPECT_EQ(load_as_float(bools.data(), DType::kBool, 0), 0.0f);
  EXPECT_EQ(load_as_float(bools.data(), DType::kBool, 1), 1.0f);
  EXPECT_EQ(load_as_float(bools.data(), DType::kBool, 2), 1.0f);
  store_from_float(bools.data(), DType::kBool, 3, -0.5f);
  EXPECT_EQ(bools[3], 1);
  store_from_float(bools.data(), DType::kBool, 1, 0.0f);
  EXPECT_EQ(bools[1], 0);
}

TEST(DTypeHelpers, SizesNamesAndParsing) {
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kF16), 2u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kBool), 1u);
  EXPECT_TRUE(is_floating(DType::kF32));
  EXPECT_TRUE(is_floating(DType::kF16));
  EXPECT_TRUE(is_floating(DType::kBF16));
  EXPECT_FALSE(is_floating(DType::kBool));
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kBool}) {
    const auto parsed = parse_dtype(dtype_name(t));
    ASSERT_TRUE(parsed.has_value()) << dtype_name(t);
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_EQ(std::string(dtype_name(DType::kBF16)), "bf16");
  EXPECT_EQ(parse_dtype("fp16"), DType::kF16);
  EXPECT_EQ(parse_dtype("half"), DType::kF16);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(parse_dtype("float32"), DType::kF32);
  EXPECT_FALSE(parse_dtype("f64").has_value());
  EXPECT_FALSE(parse_dtype("").has_value());
  EXPECT_FALSE(parse_dtype("F16x").has_value());
}

TEST(CoreTypes, StatusAndDeviceNames) {
  EXPECT_TRUE(Status().ok());
  EXPECT_EQ(Status().to_string(), "ok");
  const Status bad = Status::invalid_argument("bias2 must have shape [1]");
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.to_string(), "invalid argument: bias2 must have shape [1]");
  EXPECT_EQ(Status::not_supported("x").code(), StatusCode::kNotSupported);
  EXPECT_EQ(std::string(status_code_name(StatusCode::kWorkspaceTooSmall)), "workspace too small");
  EXPECT_EQ(std::string(device_name(Device::kCpu)), "cpu");
  EXPECT_EQ(std::string(device_name(Device::kCuda)), "cuda");
}

}  // namespace
}  // namespace sciattn

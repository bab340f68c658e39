// Element types and exact host conversions between float and the 16-bit formats.
// Public API layer (plain C++17, no CUDA headers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace sciattn {

// Storage type of a tensor. Arithmetic always happens in fp32 (or fp64 in the test reference);
// kBool is accepted only where an op documents a boolean mask (one byte per element, 0 = false).
enum class DType : int { kF32 = 0, kF16 = 1, kBF16 = 2, kBool = 3 };

constexpr size_t dtype_size(DType t) {
  return t == DType::kF32 ? 4 : t == DType::kBool ? 1 : 2;
}
constexpr bool is_floating(DType t) {
  return t != DType::kBool;
}

// "f32", "f16", "bf16", "bool".
const char* dtype_name(DType t);
// Accepts "f32"/"fp32"/"float32", "f16"/"fp16"/"float16"/"half", "bf16"/"bfloat16", "bool".
std::optional<DType> parse_dtype(std::string_view name);

// ---- Exact conversions (round-to-nearest-even; NaN stays NaN, overflow becomes +-inf). ----

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float bf16_bits_to_float(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  // Round to nearest even on the 16 discarded bits; a carry into the exponent correctly rounds
  // up to the next binade or to infinity.
  uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

inline float f16_bits_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (man << 13);  // inf or NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);  // normal: rebias 15 -> 127
  } else if (man == 0) {
    u = sign;  // signed zero
  } else {
    // Subnormal half: value = man * 2^-24, exact in float.
    float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    u = sign | float_bits(v);
  }
  return bits_float(u);
}

inline uint16_t float_to_f16_bits(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a >= 0x38800000u) {
    // Normal half. Rebias the exponent and round to nearest even on the 13 dropped bits.
    uint32_t rebased = a - 0x38000000u;  // exponent 127 -> 15
    uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((rebased + rounding) >> 13));
  }
  // Subnormal half (or zero): the result is round(|f| * 2^24) in units of 2^-24. Scaling by a
  // power of two is exact (|f| < 2^-14, so scaled < 2^10). Adding and removing 2^23 makes the
  // FPU round at the integer position, to nearest even; 1024 correctly encodes the smallest normal.
  float scaled = bits_float(a) * 16777216.0f;
  float rounded = (scaled + 8388608.0f) - 8388608.0f;
  return static_cast<uint16_t>(sign | static_cast<uint16_t>(rounded));
}

// Reads element i of a buffer of dtype t as float (kBool reads 0 or 1).
inline float load_as_float(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kF16:
      return f16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kBF16:
      return bf16_bits_to_float(static_cast<const uint16_t*>(base)[i]);
    case DType::kBool:
      return static_cast<const uint8_t*>(base)[i] != 0 ? 1.0f : 0.0f;
  }
  return 0.0f;
}

// Writes float v as element i of a buffer of dtype t, rounding to nearest even.
inline void store_from_float(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(base)[i] = v;
      break;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = float_to_f16_bits(v);
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = float_to_bf16_bits(v);
      break;
    case DType::kBool:
      static_cast<uint8_t*>(base)[i] = v != 0.0f ? 1 : 0;
      break;
  }
}

// Rounds v to the nearest value representable in t (identity for kF32).
inline float round_to(DType t, float v) {
  switch (t) {
    case DType::kF16:
      return f16_bits_to_float(float_to_f16_bits(v));
    case DType::kBF16:
      return bf16_bits_to_float(float_to_bf16_bits(v));
    default:
      return v;
  }
}

}  // namespace sciattn

// Element access through TensorViews for the CPU path: offsets from indices and strides, and
// whole-row loads/stores that convert between the storage dtype and float. CPU layer.
#pragma once

#include <cstdint>
#include <limits>

#include "sciattn/dtype.h"
#include "sciattn/tensor_view.h"

namespace sciattn::cpu {

// Element offset of index (i0, ..., i4) in a rank-5 view.
inline int64_t offset5(const TensorView& t, int64_t i0, int64_t i1, int64_t i2, int64_t i3,
                       int64_t i4) {
  return i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2] + i3 * t.strides[3] +
         i4 * t.strides[4];
}

// A bias value as it enters the scores: a boolean mask adds 0 (attend) or -inf (masked).
inline float bias_value(const TensorView& t, int64_t offset) {
  if (t.dtype == DType::kBool) {
    return static_cast<const uint8_t*>(t.data)[offset] != 0
               ? 0.0f
               : -std::numeric_limits<float>::infinity();
  }
  return load_as_float(t.data, t.dtype, offset);
}

// Loads `count` elements starting at `offset`, `stride` apart, as float into dst. The dtype
// switch sits outside the loop so the loops stay simple enough to vectorise.
inline void load_row(const TensorView& t, int64_t offset, int64_t stride, int64_t count,
                     float* dst) {
  switch (t.dtype) {
    case DType::kF32: {
      const float* src = static_cast<const float*>(t.data) + offset;
      for (int64_t i = 0; i < count; ++i) dst[i] = src[i * stride];
      break;
    }
    case DType::kF16: {
      const uint16_t* src = static_cast<const uint16_t*>(t.data) + offset;
      for (int64_t i = 0; i < count; ++i) dst[i] = f16_bits_to_float(src[i * stride]);
      break;
    }
    case DType::kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(t.data) + offset;
      for (int64_t i = 0; i < count; ++i) dst[i] = bf16_bits_to_float(src[i * stride]);
      break;
    }
    case DType::kBool: {
      const uint8_t* src = static_cast<const uint8_t*>(t.data) + offset;
      for (int64_t i = 0; i < count; ++i) {
        dst[i] = src[i * stride] != 0 ? 0.0f : -std::numeric_limits<float>::infinity();
      }
      break;
    }
  }
}

// Stores `count` floats to elements `stride` apart starting at `offset`, rounding to the dtype.
inline void store_row(const TensorView& t, int64_t offset, int64_t stride, int64_t count,
                      const float* src) {
  switch (t.dtype) {
    case DType::kF32: {
      float* dst = static_cast<float*>(t.data) + offset;
      for (int64_t i = 0; i < count; ++i) dst[i * stride] = src[i];
      break;
    }
    case DType::kF16: {
      uint16_t* dst = static_cast<uint16_t*>(t.data) + offset;
      for (int64_t i = 0; i < count; ++i) dst[i * stride] = float_to_f16_bits(src[i]);
      break;
    }
    case DType::kBF16: {
      uint16_t* dst = static_cast<uint16_t*>(t.data) + offset;
      for (int64_t i = 0; i < count; ++i) dst[i * stride] = float_to_bf16_bits(src[i]);
      break;
    }
    case DType::kBool: {
      uint8_t* dst = static_cast<uint8_t*>(t.data) + offset;
      for (int64_t i = 0; i < count; ++i) dst[i * stride] = src[i] != 0.0f ? 1 : 0;
      break;
    }
  }
}

}  // namespace sciattn::cpu

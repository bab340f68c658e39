// The exponent shift of the 16-bit tensor-core forwards' probabilities. Host-only C++ of the CUDA
// layer, shared by the Evoformer and block-sparse dispatch.
//
// Those forwards add the products P V of the online softmax unnormalised, in fp32, and divide by
// the row's sum once at the end (the running max keeps each P <= 1). With bf16 inputs a row's sum
// of P |v| can pass fp32's largest value (about 3.4e38) although the result, a weighted mean of
// V's rows, is finite: V filled with 1e37 at L = 300. Taking P as 2^(s - max - k) with
// 2^k >= the number of keys a row can see bounds the accumulator by max |v| at no cost (k is
// folded into the shift already subtracted from each score); the row's sum carries the same
// factor, so O is unchanged and lse adds k ln 2 back. f16 values stay below 65,504, whose sum
// cannot overflow fp32, and a shifted f16 P would lose bits to subnormals: k is 0 there.
#pragma once

#include <cstdint>

#include "sciattn/tensor_view.h"

namespace sciattn::cuda {

// k above, as a float for the kernels: ceil(log2(keys)) for bf16 inputs, 0 otherwise.
inline float probability_shift_log2(DType inputs, int64_t keys) {
  if (inputs != DType::kBF16) return 0.0f;
  int k = 0;
  while (k < 62 && (int64_t{1} << k) < keys) ++k;
  return static_cast<float>(k);
}

}  // namespace sciattn::cuda

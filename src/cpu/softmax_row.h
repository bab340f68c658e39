// The maximum every CPU softmax starts from, with the two rules its callers rely on. CPU layer.
//
//  - A fully masked row (every score -inf) has maximum -inf; the caller gives it probabilities 0,
//    output 0 and log-sum-exp -inf, not the NaN of exp(-inf - (-inf)). That is a rule about
//    masks.
//  - A NaN score is not a masked one: a NaN in any input must reach the outputs and gradients it
//    touches, as in PyTorch. std::max(m, NaN) is m, so a row whose scores are all NaN (a NaN in
//    q) would look fully masked and quietly become 0; these functions return NaN for it instead,
//    and the caller's exp(s - NaN) turns the row into NaN. A row with a finite maximum needs no
//    such care: its NaN scores give exp(NaN - max) = NaN in the sum.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace sciattn::cpu {

// The largest of row[0 .. n-1] (strided by `stride`); -inf for a fully masked (or empty) row,
// NaN for a row whose scores are all NaN or -inf with at least one NaN.
template <typename T>
inline T softmax_row_max(const T* row, int64_t n, int64_t stride = 1) {
  T max = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < n; ++j) max = std::max(max, row[j * stride]);
  // Only a row that looks fully masked is scanned again, so the common path costs nothing.
  if (max == -std::numeric_limits<T>::infinity()) {
    for (int64_t j = 0; j < n; ++j) {
      if (std::isnan(row[j * stride])) return std::numeric_limits<T>::quiet_NaN();
    }
  }
  return max;
}

// The running maximum of an online softmax after a tile whose softmax_row_max is `tile_max`:
// NaN from the first NaN on, so that the row stays NaN however many tiles follow.
template <typename T>
inline T running_softmax_max(T row_max, T tile_max) {
  if (std::isnan(row_max) || std::isnan(tile_max)) return std::numeric_limits<T>::quiet_NaN();
  return std::max(row_max, tile_max);
}

}  // namespace sciattn::cpu

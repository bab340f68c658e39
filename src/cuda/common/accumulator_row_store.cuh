// Writes one row of an MMA accumulator tile (the m16n8 layout: lane = 4 g + t holds columns
// 8 i + 2 t and 8 i + 2 t + 1 of its rows, i = 0 .. kOutTiles - 1) into a 16-bit output row with
// unit stride, for the attention epilogues (Evoformer and block-sparse: O, dQ, dK, dV). CUDA layer.
//
// Three forms, by what the caller knows of the rows:
//   - `pairs_aligned` (the launch's *_paired flag: every row 4-byte aligned and D even): one 32-bit
//     store per pair of columns below D, no test per row;
//   - every row of the slice on a 4-byte boundary (`may_start_odd` false): the thread's own
//     pair as one 32-bit store while both columns are below D, the last column of an odd D alone;
//   - rows that may start on a 2-byte boundary (an odd row stride, as an odd D's, or a slice one
//     element off): per row, the above on a 4-byte boundary, and on a 2-byte one a 32-bit word
//     holding columns (c - 1, c) for even c, whose first column is the left-hand neighbour's
//     (lane t - 1, or lane 3 of the previous 8 columns for t = 0), passed by a shuffle; column 0
//     and an unpaired last odd column are single 16-bit stores. This form is warp-collective (the
//     shuffles): every lane of the warp calls it for the same r, with `write` false where its row
//     is not written (past L); `may_start_odd` (rows_may_start_odd below) is the same for every
//     lane of a CTA.
// Each form stops at the first 8-column tile past D (a padded D writes fewer tiles than the head
// dim has; dim is the same in every lane, so the shuffles stay warp-wide). `skip_first`: column 0
// is not written (an accumulator whose column c + 1 is element c, from shifted slices: the caller
// passes the row one element before the output's, and D + 1).
#pragma once

#include <cstdint>

#include "cuda/common/device_utils.cuh"

namespace sciattn::cuda {

// Two 16-bit elements as one 32-bit store at `at`, which must be 4-byte aligned (the GPU stops
// with a misaligned-address error otherwise; the host emulation checks it).
template <typename T>
__device__ __forceinline__ void store_pair(T* at, uint32_t pair) {
  *reinterpret_cast<uint32_t*>(at) = pair;
}

// Whether some row of a slice whose row 0 is at `slice` and whose rows are `row_stride` elements
// apart may start on a 2-byte boundary (16-bit elements).
template <typename T>
__device__ __forceinline__ bool rows_may_start_odd(const T* slice, int64_t row_stride) {
  return sizeof(T) == 2 && ((reinterpret_cast<uintptr_t>(slice) & 3) != 0 || (row_stride & 1) != 0);
}

template <typename T, int kOutTiles>
__device__ __forceinline__ void store_accumulator_row(T* row, const float acc[kOutTiles][4], int r,
                                                      float factor, int64_t dim, int t,
                                                      bool pairs_aligned, bool may_start_odd,
                                                      bool write, bool skip_first = false) {
  using Traits = ElementTraits<T>;
  if constexpr (sizeof(T) != 2) {
    // 32-bit outputs: every element is its own aligned word.
    if (!write) return;
#pragma unroll
    for (int i = 0; i < kOutTiles; ++i) {
      if (i * 8 >= dim) break;  // the tiles past D (dim is the same in every lane)
      const int d = i * 8 + 2 * t;
      if (d < dim) row[d] = Traits::from_float(acc[i][2 * r] * factor);
      if (d + 1 < dim) row[d + 1] = Traits::from_float(acc[i][2 * r + 1] * factor);
    }
  } else {
    if (pairs_aligned) {
      if (!write) return;
#pragma unroll
      for (int i = 0; i < kOutTiles; ++i) {
        if (i * 8 >= dim) break;  // the tiles past D (dim is the same in every lane)
        const int d = i * 8 + 2 * t;
        if (d < dim) {
          store_pair(row + d, Traits::pack(acc[i][2 * r] * factor, acc[i][2 * r + 1] * factor));
        }
      }
      return;
    }
    if (!may_start_odd) {
      // Every row of the slice starts on a 4-byte boundary: the thread's own pairs.
      if (!write) return;
#pragma unroll
      for (int i = 0; i < kOutTiles; ++i) {
        if (i * 8 >= dim) break;  // the tiles past D (dim is the same in every lane)
        const int d = i * 8 + 2 * t;
        const float lo = acc[i][2 * r] * factor, hi = acc[i][2 * r + 1] * factor;
        if (d == 0 && skip_first) {
          row[1] = Traits::from_float(hi);  // column 0 of a shifted row: its second alone
        } else if (d + 1 < dim) {
          store_pair(row + d, Traits::pack(lo, hi));
        } else if (d < dim) {
          row[d] = Traits::from_float(lo);
        }
      }
      return;
    }
    const bool odd_start = (reinterpret_cast<uintptr_t>(row) & 3) != 0;
    const int lane = static_cast<int>(threadIdx.x & 31);
    const int left_lane = (lane & ~3) | ((t + 3) & 3);
    // Column 8 i - 1 for lane t = 0: lane 3's second column of the previous 8.
    float carried = 0.0f;
#pragma unroll
    for (int i = 0; i < kOutTiles; ++i) {
      if (i * 8 >= dim) break;  // the tiles past D (dim is the same in every lane)
      const int d = i * 8 + 2 * t;
      const float lo = acc[i][2 * r] * factor, hi = acc[i][2 * r + 1] * factor;
      const float left_hi = __shfl_sync(0xffffffffu, hi, left_lane);
      const float left = t == 0 ? carried : left_hi;  // column d - 1
      carried = left_hi;
      if (!write) continue;
      if (odd_start) {
        if (d < dim) {
          if (d == 0) {
            if (!skip_first) row[0] = Traits::from_float(lo);
          } else {
            store_pair(row + d - 1, Traits::pack(left, lo));
          }
        }
        // The last column, odd, has no right-hand partner.
        if (d + 2 == dim) row[d + 1] = Traits::from_float(hi);
      } else if (d == 0 && skip_first) {
        row[1] = Traits::from_float(hi);
      } else if (d + 1 < dim) {
        store_pair(row + d, Traits::pack(lo, hi));
      } else if (d < dim) {
        row[d] = Traits::from_float(lo);
      }
    }
  }
}

}  // namespace sciattn::cuda

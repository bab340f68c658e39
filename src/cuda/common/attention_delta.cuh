// delta_i = <dO_i, O_i>, the first step of every attention backward here (Evoformer and
// block-sparse): kLanes lanes of a warp per row, 32 / kLanes rows per warp, in a grid-stride loop.
// With 16-byte rows (16-bit types whose rows are 16-byte aligned with unit D stride) lane s of a
// row reads elements 8 s .. 8 s + 7, then 8 kLanes further on, so a row's lanes read it whole in
// one transaction, and kLanes = D / 8 up to 8 (head dim 32: four lanes a row, eight rows a warp;
// with eight lanes half of them had nothing to read); otherwise eight lanes and d = s, s + 8, ...
// element by element. The lanes' sums are added in a fixed tree order, so the result is
// deterministic. (One thread per row read 32 rows D apart: 0.75 ms at 65,536 tokens, H = 16,
// D = 64, for 268 MB that take 62 us at 4.3 TB/s.) CUDA layer.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/device_utils.cuh"

namespace sciattn::cuda {

// One row of the problem: its O and dO rows (pointers to element d = 0) and where its delta goes.
template <typename T>
struct DeltaRow {
  const T* o;
  const T* dout;
  int64_t index;
};

// For each row < rows: row_of(row) gives its DeltaRow; delta[index] receives the dot product.
// step_o / step_do: the D strides (used only when !vec). row_of is called with a 32-bit row when
// the rows fit (so that its division and modulo by the tensor's sizes are the cheap 32-bit ones:
// the 64-bit sequences took most of this kernel's time), else with a 64-bit one; it should
// compute in decltype(row). Every lane of a warp runs the same iterations (the shuffles need the
// whole warp).
template <typename T, int kLanes, typename Index, typename RowOf>
__device__ __forceinline__ void delta_rows_of(Index rows, int64_t dim, bool vec, int64_t step_o,
                                              int64_t step_do, const RowOf& row_of, float* delta) {
  constexpr int kRowsPerWarp = 32 / kLanes;
  const int sub = static_cast<int>(threadIdx.x) % kLanes;
  const Index warps = static_cast<Index>(gridDim.x * (blockDim.x / 32));
  for (Index base =
           static_cast<Index>(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32) * kRowsPerWarp;
       base < rows; base += warps * kRowsPerWarp) {
    const Index row = base + static_cast<Index>((threadIdx.x % 32) / kLanes);
    float acc = 0.0f;
    int64_t index = 0;
    if (row < rows) {
      const DeltaRow<T> r = row_of(row);
      index = r.index;
      if (vec) {
        for (int64_t d = 8 * sub; d < dim; d += 8 * kLanes) {
          const uint4 ov = *reinterpret_cast<const uint4*>(r.o + d);
          const uint4 gv = *reinterpret_cast<const uint4*>(r.dout + d);
          const T* oe = reinterpret_cast<const T*>(&ov);
          const T* ge = reinterpret_cast<const T*>(&gv);
#pragma unroll
          for (int x = 0; x < 8; ++x) {
            acc += ElementTraits<T>::to_float(oe[x]) * ElementTraits<T>::to_float(ge[x]);
          }
        }
      } else {
        for (int64_t d = sub; d < dim; d += kLanes) {
          acc += ElementTraits<T>::to_float(r.o[d * step_o]) *
                 ElementTraits<T>::to_float(r.dout[d * step_do]);
        }
      }
    }
#pragma unroll
    for (int m = kLanes / 2; m >= 1; m /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, m);
    if (row < rows && sub == 0) delta[index] = acc;
  }
}

template <typename T, int kLanes, typename RowOf>
__device__ __forceinline__ void delta_rows(int64_t rows, int64_t dim, bool vec, int64_t step_o,
                                           int64_t step_do, const RowOf& row_of, float* delta) {
  static_assert(kLanes == 1 || kLanes == 2 || kLanes == 4 || kLanes == 8, "lanes per row");
  // 32-bit rows while base + the grid's stride cannot wrap.
  if (rows + int64_t{gridDim.x} * blockDim.x < (int64_t{1} << 32)) {
    delta_rows_of<T, kLanes, uint32_t>(static_cast<uint32_t>(rows), dim, vec, step_o, step_do,
                                       row_of, delta);
  } else {
    delta_rows_of<T, kLanes, int64_t>(rows, dim, vec, step_o, step_do, row_of, delta);
  }
}

// The lanes per row for head dim `dim`: as many as a 16-byte row has 16-byte pieces, up to eight,
// when `vec` (the 16-byte path); eight otherwise. Chosen on the host, where the kernel is picked
// (one instantiation per count: a kernel holding all four took registers and slowed the D = 64
// delta).
inline int delta_lanes(int64_t dim, bool vec) {
  if (!vec) return 8;
  return dim <= 8 ? 1 : dim <= 16 ? 2 : dim <= 32 ? 4 : 8;
}

// Calls launch(std::integral_constant<int, kLanes>) for kLanes = delta_lanes(dim, vec): it
// launches that instantiation and returns its status.
template <typename Launch>
auto launch_with_delta_lanes(int64_t dim, bool vec, const Launch& launch) {
  switch (delta_lanes(dim, vec)) {
    case 1:
      return launch(std::integral_constant<int, 1>{});
    case 2:
      return launch(std::integral_constant<int, 2>{});
    case 4:
      return launch(std::integral_constant<int, 4>{});
    default:
      return launch(std::integral_constant<int, 8>{});
  }
}

// CTAs of `threads` threads for `rows` rows (eight lanes each, the most a row takes), at most
// `cap`.
inline unsigned delta_grid(int64_t rows, int threads, int64_t cap) {
  const int64_t rows_per_cta = threads / 8;
  const int64_t ctas = (rows + rows_per_cta - 1) / rows_per_cta;
  return static_cast<unsigned>(ctas < 1 ? 1 : ctas > cap ? cap : ctas);
}

}  // namespace sciattn::cuda

// The trainer's strided copy on CUDA: dst = src between two views of the same sizes with any
// element strides, the layout copies around Ulysses sequence parallelism's all-to-alls. CUDA
// layer of the trainer. The view is first simplified on the host (dimensions of size 1 dropped,
// neighbours that are contiguous on both sides merged); then rows (every dimension but the last)
// are copied by groups of threads, runs of a last dimension that is packed on both sides in the
// widest unit (up to 16 bytes) that every address, row stride and run length allow, any other
// last dimension element by element. Offsets are 64-bit throughout.
#include <cstdint>

#include "train/cuda/kernels_common.cuh"
#include "train/cuda/layers_cuda.h"

namespace sciattn::train::cuda {
namespace {

constexpr int kThreads = 256;
// Row dimensions a simplified view can have: every dimension of a rank-6 view but the last.
constexpr int kMaxRowDims = 5;

// Division by a divisor fixed at launch, for the row index's coordinates. With 32-bit indexes:
// q = (umulhi(n, m) + n) >> s, m = floor(2^32 (2^s - d) / d) + 1, s = ceil(log2 d)
// (Granlund and Montgomery; exact for every 32-bit n, the sum taken in 64 bits), a few
// instructions where a 32-bit division takes about twenty. With 64-bit indexes (more than 2^32
// rows or a dimension that large) the plain division.
template <typename I>
struct Divisor;

template <>
struct Divisor<uint32_t> {
  uint32_t d = 1, m = 1, s = 0;
  Divisor() = default;
  explicit Divisor(uint64_t divisor) : d(static_cast<uint32_t>(divisor)) {
    while ((uint64_t{1} << s) < divisor) ++s;
    m = static_cast<uint32_t>((((uint64_t{1} << s) - divisor) << 32) / divisor + 1);
  }
  __device__ __forceinline__ uint32_t div(uint32_t n) const {
    return static_cast<uint32_t>((static_cast<uint64_t>(__umulhi(n, m)) + n) >> s);
  }
};

template <>
struct Divisor<uint64_t> {
  uint64_t d = 1;
  Divisor() = default;
  explicit Divisor(uint64_t divisor) : d(divisor) {}
  __device__ __forceinline__ uint64_t div(uint64_t n) const { return n / d; }
};

// A simplified copy: `rows` rows over row dimensions sizes[0 .. dims) (byte strides per side),
// each row `items` items of `item_units` units of U, items `src_item` / `dst_item` bytes apart.
// The work is cut into pieces of `group` consecutive items of one row: `pieces` = rows x
// `row_pieces`, so that a long run (a packed copy merged into one row) still spreads over the
// whole GPU.
template <typename I>
struct CopyShape {
  int dims = 0;
  Divisor<I> sizes[kMaxRowDims];
  int64_t src_strides[kMaxRowDims] = {};
  int64_t dst_strides[kMaxRowDims] = {};
  Divisor<I> row_pieces;
  I pieces = 0;
  int64_t items = 0;
  int64_t src_item = 0, dst_item = 0;
  int item_units = 1;
};

// `group` threads (a power of two dividing the block) per piece, pieces in a grid-stride loop;
// the threads of a group take consecutive items, so a run is read and written in consecutive
// units.
template <typename U, typename I>
__global__ void strided_copy_kernel(char* dst, const char* src, const CopyShape<I> s, int group) {
  const int lane = static_cast<int>(threadIdx.x) % group;
  const I pieces_per_block = static_cast<I>(blockDim.x / group);
  const I step = static_cast<I>(gridDim.x) * pieces_per_block;
  for (I piece =
           static_cast<I>(blockIdx.x) * pieces_per_block + static_cast<I>(threadIdx.x) / group;
       piece < s.pieces; piece += step) {
    I rest = s.row_pieces.div(piece);
    const int64_t it = static_cast<int64_t>(piece - rest * s.row_pieces.d) * group + lane;
    if (it >= s.items) continue;
    int64_t src_offset = it * s.src_item, dst_offset = it * s.dst_item;
#pragma unroll
    for (int d = kMaxRowDims - 1; d >= 0; --d) {
      if (d < s.dims) {
        const I q = s.sizes[d].div(rest);
        const auto i = static_cast<int64_t>(rest - q * s.sizes[d].d);
        rest = q;
        src_offset += i * s.src_strides[d];
        dst_offset += i * s.dst_strides[d];
      }
    }
    const U* a = reinterpret_cast<const U*>(src + src_offset);
    U* b = reinterpret_cast<U*>(dst + dst_offset);
    for (int k = 0; k < s.item_units; ++k) b[k] = a[k];
  }
}

// One dimension of the simplified view.
struct Dim {
  int64_t size, src_stride, dst_stride;  // strides in bytes
};

// Threads per piece: the row's items up to a block.
int group_for(int64_t items) {
  int group = 1;
  while (group < items && group < kThreads) group *= 2;
  return group;
}

template <typename U, typename I>
cudaError_t launch(void* dst, const void* src, const Dim* dims, int row_dims, int64_t rows,
                   int64_t items, int64_t src_item, int64_t dst_item, int item_units,
                   cudaStream_t stream) {
  CopyShape<I> s;
  s.dims = row_dims;
  for (int d = 0; d < row_dims; ++d) {
    s.sizes[d] = Divisor<I>(static_cast<uint64_t>(dims[d].size));
    s.src_strides[d] = dims[d].src_stride;
    s.dst_strides[d] = dims[d].dst_stride;
  }
  const int group = group_for(items);
  const int64_t row_pieces = (items + group - 1) / group;
  s.row_pieces = Divisor<I>(static_cast<uint64_t>(row_pieces));
  s.pieces = static_cast<I>(rows * row_pieces);
  s.items = items;
  s.src_item = src_item;
  s.dst_item = dst_item;
  s.item_units = item_units;
  strided_copy_kernel<U, I><<<grid_for(rows * row_pieces * group, kThreads), kThreads, 0, stream>>>(
      static_cast<char*>(dst), static_cast<const char*>(src), s, group);
  return cudaGetLastError();
}

}  // namespace

cudaError_t strided_copy(void* dst, const int64_t* dst_strides, const void* src,
                         const int64_t* src_strides, const int64_t* sizes, int rank,
                         size_t elem_bytes, cudaStream_t stream) {
  if (rank < 1 || rank > kMaxRowDims + 1 || elem_bytes == 0) return cudaErrorInvalidValue;
  const auto es = static_cast<int64_t>(elem_bytes);
  // Simplify: drop dimensions of size 1, merge a dimension into its outer neighbour when both
  // sides step over it contiguously.
  Dim dims[kMaxRowDims + 1];
  int n = 0;
  for (int d = 0; d < rank; ++d) {
    if (sizes[d] == 0) return cudaSuccess;
    if (sizes[d] == 1) continue;
    const Dim next{sizes[d], src_strides[d] * es, dst_strides[d] * es};
    if (n > 0 && dims[n - 1].src_stride == next.src_stride * next.size &&
        dims[n - 1].dst_stride == next.dst_stride * next.size) {
      dims[n - 1] = Dim{dims[n - 1].size * next.size, next.src_stride, next.dst_stride};
    } else {
      dims[n++] = next;
    }
  }
  if (n == 0) dims[n++] = Dim{1, es, es};  // a single element
  const Dim last = dims[n - 1];
  const int row_dims = n - 1;
  int64_t rows = 1;
  for (int d = 0; d < row_dims; ++d) rows *= dims[d].size;
  // The widest unit that divides both addresses, every row stride and the item layout: a packed
  // run is one item of run-length bytes cut into units, any other last dimension one item per
  // element.
  const bool packed = last.src_stride == es && last.dst_stride == es;
  uint64_t bits = reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src);
  for (int d = 0; d < row_dims; ++d) {
    bits |= static_cast<uint64_t>(dims[d].src_stride) | static_cast<uint64_t>(dims[d].dst_stride);
  }
  bits |= packed ? static_cast<uint64_t>(last.size * es)
                 : static_cast<uint64_t>(es) | static_cast<uint64_t>(last.src_stride) |
                       static_cast<uint64_t>(last.dst_stride);
  auto run = [&](auto unit) {
    using U = decltype(unit);
    constexpr auto u = static_cast<int64_t>(sizeof(U));
    const int64_t items = packed ? last.size * es / u : last.size;
    const int64_t src_item = packed ? u : last.src_stride;
    const int64_t dst_item = packed ? u : last.dst_stride;
    const int item_units = packed ? 1 : static_cast<int>(es / u);
    // 32-bit piece and coordinate arithmetic when every value fits (the pieces outnumber the
    // rows and each row's pieces; the row coordinates are below the rows).
    const int64_t pieces = rows * ((items + group_for(items) - 1) / group_for(items));
    const bool wide = pieces > INT32_MAX;
    return wide ? launch<U, uint64_t>(dst, src, dims, row_dims, rows, items, src_item, dst_item,
                                      item_units, stream)
                : launch<U, uint32_t>(dst, src, dims, row_dims, rows, items, src_item, dst_item,
                                      item_units, stream);
  };
  if (bits % 16 == 0) return run(uint4{});
  if (bits % 8 == 0) return run(uint2{});
  if (bits % 4 == 0) return run(uint32_t{});
  if (bits % 2 == 0) return run(uint16_t{});
  return run(uint8_t{});
}

}  // namespace sciattn::train::cuda
